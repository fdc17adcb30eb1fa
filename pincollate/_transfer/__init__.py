"""From host to device: moving any tree, the Prefetcher and GPU-side transforms."""
