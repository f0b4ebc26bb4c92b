"""Solvers the algorithms share: L-BFGS and OWL-QN, penalised objectives, the normal equations,
the multinomial objective, row weights and the elastic net. Written on ``arrayjob.api`` alone."""
