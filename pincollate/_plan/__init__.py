"""Planning a structure: the careful walk, policies, and the plan a structure runs for every later batch."""
