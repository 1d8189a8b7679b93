"""The serving loop: the compiled loop and its state, the plain-Python twin it is checked against,
and the flow-shop recurrence of one micro-batch through a pipeline of stages."""
