"""Supervised fine-tuning with ``trl.SFTTrainer``.

Run through the component (it validates and embeds the spec)::

    torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml
"""

from posttrain.entrypoints.runtime import run

if __name__ == "__main__":
    run("sft")
