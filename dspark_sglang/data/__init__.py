"""Evaluation and training prompt sets (GSM8K, HumanEval, MT-Bench) as chat messages."""
