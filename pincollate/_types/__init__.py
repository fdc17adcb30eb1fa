"""Leaf and container types: the one registry every stage walks a sample with."""
