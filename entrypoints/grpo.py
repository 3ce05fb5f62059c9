"""Group relative policy optimisation with ``trl.GRPOTrainer``; GSPO is ``importance_sampling_level: sequence``.

torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny.yaml
torchx run -s local_cwd posttrain.grpo --spec templates/grpo/gspo-tiny.yaml
"""

from posttrain.entrypoints.runtime import run

if __name__ == "__main__":
    run("grpo")
