"""Local Service Bus namespace: an AMQP 1.0 server for the unmodified azure-servicebus SDK (SPEC E1-E6)."""
