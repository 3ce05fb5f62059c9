"""Online DPO with ``trl.experimental.online_dpo.OnlineDPOTrainer``: pairs sampled and scored by ``rewards``.

torchx run -s local_cwd posttrain.online_dpo --spec templates/online_dpo/tiny.yaml
"""

from posttrain.entrypoints.runtime import run

if __name__ == "__main__":
    run("online_dpo")
