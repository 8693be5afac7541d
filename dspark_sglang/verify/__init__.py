"""Lossless verification of draft blocks (chain speculative sampling, greedy)."""

from dspark_sglang.verify.chain import PAD_TOKEN, VerifyResult, chain_verify, greedy_verify

__all__ = ["PAD_TOKEN", "VerifyResult", "chain_verify", "greedy_verify"]
