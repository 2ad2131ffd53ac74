"""CFFL's task fields: the trained model's validation score, asked for and reported."""

# server -> site
VALIDATE_TRAINED = "validate_trained"  # after training, score the trained model on the validation split (True)

# site -> server
VAL_METRIC = "val_metric"  # Dice (classification: balanced accuracy) of the trained model on the validation split;
# None when it cannot be scored
