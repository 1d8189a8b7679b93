"""Models: the shapes of a decoder-only transformer (ModelSpec), their architecture families,
Hugging Face configs, the one description of a layer, weights in their stored formats and how a
step's tokens pick their experts. Above util only."""
