"""How Triton is reached: its admin and inference API, the replicas behind a Service, perf_analyzer, and the
metrics a server reports. Imports the model room and the ground floor.

    triton_admin    EXPLICIT model control: load, unload, ready versions, inference
    admin_key       the restricted-API key Triton's admin endpoints ask for
    replicas        production replicas: host:port[:metrics-port] or k8s://namespace/selector
    perf            perf_analyzer runs and their per-request latencies
    tools           finding the embedded tools; the CPUs perf_analyzer runs on
    server_metrics  Triton's GPU and CPU metrics during a measurement
    live_metrics    Triton's per-model request counters and latency summaries, for the canary
"""
