"""Direct preference optimisation with ``trl.DPOTrainer``.

torchx run -s local_cwd posttrain.dpo --spec templates/dpo/tiny.yaml
"""

from posttrain.entrypoints.runtime import run

if __name__ == "__main__":
    run("dpo")
