"""A run's life cycle, below the entry points (`icml_jax.main`, `evaluate`, `chat`, `erasure`, `memory_api`) and
above the library (agents, rl, train, synthesis, llm, models, data, memory, checkpoint): the typed configs
(`runspec`), the shared flags and one-line errors (`cli`), every check before a stage runs (`validation`), the
models (`builders`), the job (`pipeline`) and its `stages/`, the workdir's files and resume points (`workdir`),
the metrics log (`runlog`), and a trained agent loaded back from a workdir (`agent_loading`: what the chat, the
evaluation and the Memory API load). Nothing here imports an entry point; this file imports nothing, so
`icml_jax.run.<module>` loads only what that module needs."""
