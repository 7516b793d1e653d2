"""SFT's parts: tokenised (question, solution) batches, padding-free packing, the forgetting guard."""
