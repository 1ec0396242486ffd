# examples/without_spark.py: the failover-aware sender and the syphon in a plain Python program
from spark_sb import OutboundMessage, PairedSender, Syphon, load_config

config = load_config("conf/local.yaml")
with PairedSender(config) as sender:  # one per thread
    outcome = sender.send(OutboundMessage(body=f"order {i}", message_id=str(i)) for i in range(1000))
    print(outcome.sent, outcome.diverted, outcome.rejects, outcome.transitions)

with Syphon(config) as syphon:  # moves backlog messages back to their entities
    syphon.drain_all(max_wait=1)  # queue by queue, each until a receive waited 1 s for nothing
