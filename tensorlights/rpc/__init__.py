"""The gRPC layer: generated code (v1/, from proto/), validation and conversion between wire
messages and the model (convert.py: the only place the two meet), and TLS credentials."""
