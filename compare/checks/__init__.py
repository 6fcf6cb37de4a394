"""The generic checks of the parity harness, by what they judge.

    basics      configuration, variables, checkpoint round trip, input pipelines
    forward     inference, dropout, training forward pass and gradients, free variables
    splits      short, uneven and tiny batches over the towers and replicas
    steps       learning-rate schedule, restart-per-step training with each side's optimizer
                against its own rule, step counters, batch-norm moving statistics
    averages    moving averages of the variables
    free        free-running trajectories against the measured chaos floor
    evaluation  both programs' evaluation of one checkpoint
    tf1         the legacy graph on TF1's own runtime

Every check takes a built pairing (`compare.sides.Sides`) and returns Results.
"""
