"""On-policy distillation from ``teacher_model`` with ``trl.DistillationTrainer``.

torchx run -s local_cwd posttrain.distill --spec templates/distill/tiny.yaml
"""

from posttrain.entrypoints.runtime import run

if __name__ == "__main__":
    run("distill")
