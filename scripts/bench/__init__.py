"""The benchmarks (`pdm run bench*`) and the libraries they share."""
