"""The trainers posttrain writes itself: PPO (TRL 1.16 has none), its rollout and its maths."""
