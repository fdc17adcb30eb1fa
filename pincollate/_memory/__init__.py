"""Memory a batch lives in: worker ring slots, shared memory, pinned buffers, and when each is reused."""
