"""A Flower App for tests/bench/bench_vs_flower.py: FedAvg, digits split IID, MLP 64-h-h-10."""
