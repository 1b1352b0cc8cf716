"""Generated protobuf modules for the bookie wire protocol and records (run `make proto`)."""
