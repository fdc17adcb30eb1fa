"""The batch as an object: its layout, its views over one buffer, checking, moving and crossing it."""
