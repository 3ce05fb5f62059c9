"""Kahneman-Tversky optimisation on unpaired good/bad labels with ``trl.KTOTrainer``.

torchx run -s local_cwd posttrain.kto --spec templates/kto/tiny.yaml
"""

from posttrain.entrypoints.runtime import run

if __name__ == "__main__":
    run("kto")
