"""Print the package's import graph (one line per module, its imports after the arrow), its tools' imports of it,
any import cycle and any broken house rule (behaviortrace/layers.py; tests/test_architecture.py checks them).

    python diagnostics/import_graph.py
"""

from pathlib import Path

from behaviortrace.layers import main

if __name__ == "__main__":
    raise SystemExit(main(Path(__file__).resolve().parents[1]))
