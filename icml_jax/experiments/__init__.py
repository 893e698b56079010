"""The paper's experiments on top of the library: the persona-world learning run, and one runner per paper
result (`python -m icml_jax.experiments --experiment=NAME`). Nothing below (agents, rl, train, synthesis, llm,
models, data, memory) imports this package."""
