"""Shared test helpers: the moto S3 server, sample warehouses."""
