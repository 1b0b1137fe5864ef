"""Shared test helpers: the moto S3 server, sample warehouses, and HTTP servers on 127.0.0.1 (a static
file host with Range support and a 503-injecting proxy, :mod:`support.httpserve`)."""
