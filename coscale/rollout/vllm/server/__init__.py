"""vLLM as a server for the run (``rollout.backend: vllm-server``): coscale starts ``vllm serve``
in its own process, or attaches to one by URL, and every rank samples from it over HTTP; the
trainer's weights reach it through vLLM's RL routes (pause, load, weight version, resume).

One idea a file: `settings` (the ``server`` group), `launch` (the ``vllm serve`` process),
`client` (the HTTP calls), `worker` (the extension loaded into vLLM's workers), `engine` (the
server behind the engine calls `VLLMBackend` makes), `backend` (`VLLMServerBackend`).
Nothing here imports vllm in the trainer's process.
"""
