"""REINFORCE leave-one-out with ``trl.RLOOTrainer``.

torchx run -s local_cwd posttrain.rloo --spec templates/rloo/tiny.yaml
"""

from posttrain.entrypoints.runtime import run

if __name__ == "__main__":
    run("rloo")
