"""What the benchmarks, diagnostics and tests share, on a floor of their own above every layer (no module of the
package imports it): checkout.py finds the repository they run from, small_runs.py the tests' small configs,
grpo_checks.py GRPO runs with spies for the numerical checks, workflows.py reduced workflows run side by side."""
