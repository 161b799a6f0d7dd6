"""How Triton is reached: its admin and inference API, the replicas behind a Service, perf_analyzer, and the
metrics a server reports. Imports the model room and the ground floor.

    triton_admin    EXPLICIT model control: load, unload, ready versions, inference
    admin_key       the restricted-API key Triton's admin endpoints ask for
    replicas        production replicas: host:port[:metrics-port] or k8s://namespace/selector
    perf            perf_analyzer runs: the load it offers, its clients, what each run measured
    perf_output     what perf_analyzer writes, read: its CSV rows and the requests of its measured windows
    tools           finding the embedded tools; the CPUs perf_analyzer runs on
    server_metrics  Triton's GPU and CPU metrics during a measurement
    live_metrics    Triton's per-model request counters and latency summaries, for the canary
"""
