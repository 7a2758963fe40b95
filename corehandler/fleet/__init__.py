"""The fleet: the bucket, the durable upload queue, the objects a host uploads, the fleet view."""
