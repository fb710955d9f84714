"""What the serving load test and benchmark share, one part per module.

workload: the requests a load test sends (short and long chat prompts, Poisson
arrival times, which clients give up early).
client: sends them to an OpenAI-compatible server over HTTP and times every chunk.
report: the numbers (TTFT, ITL, throughput, errors), the table, JSON and plots.

Nothing here imports MLX: a load test is only a client.
"""
