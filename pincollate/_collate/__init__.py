"""``MMCollate``: a batch's samples through their plan into one buffer."""
