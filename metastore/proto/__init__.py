"""Generated protobuf modules for metastore records (run `make proto`)."""
