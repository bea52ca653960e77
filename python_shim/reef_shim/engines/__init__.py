"""Engine servers Reef launches: `hf_server` (CPU, transformers) speaks the same HTTP API as SGLang.

`sampling.tempered_logprobs` recomputes the logprobs the `hf` engine reports (SGLang's convention)
and `sampling.sampling_logprobs` the truncated distribution it draws tokens from, importable on
their own (torch only) by a trainer that must reproduce the engine's numbers.
"""
