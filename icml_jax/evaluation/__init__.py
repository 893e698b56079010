"""Evaluation on the paper's protocol: reply metrics, judges, memory and efficiency figures."""
