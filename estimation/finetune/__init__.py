"""Fine-tuning estimators: YMIR's convergence fits and Task2Vec transferability."""
