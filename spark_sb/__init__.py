"""spark-servicebus: a Structured Streaming sink for Azure Service Bus with paired-namespace failover."""
