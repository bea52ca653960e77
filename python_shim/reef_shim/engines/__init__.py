"""Engine servers Reef launches: `hf_server` (CPU, transformers) speaks the same HTTP API as SGLang.

`sampling.sampling_logprobs` is the `hf` engine's sampling distribution, importable on its own
(torch only) by a trainer that must reproduce the engine's logprobs.
"""
