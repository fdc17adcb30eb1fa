"""Other libraries' data paths: Ray Data columns, PIL and torchvision types."""
