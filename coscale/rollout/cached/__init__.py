"""The cached decode backend: coscale's own decode loop on the policy (shared prompt prefill,
finished rows dropped, a preallocated KV cache; `CachedDecodeBackend` in
`coscale.rollout.cached.backend`), its KV caches and its compiled decode step."""

from coscale.rollout.cached.backend import CachedDecodeBackend

__all__ = ["CachedDecodeBackend"]
