"""Odds-ratio preference optimisation, SFT and preference in one loss (``trl.experimental.orpo``).

torchx run -s local_cwd posttrain.orpo --spec templates/orpo/tiny.yaml
"""

from posttrain.entrypoints.runtime import run

if __name__ == "__main__":
    run("orpo")
