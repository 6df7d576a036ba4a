"""Exact influence: every rollout's effect on the behavior through the replayed training.

For a rollout z logged at step t, I_z = d f(w_T) / d u_z at u = 1, where u_z is z's weight in TRL's loss at
step t, with one of two meanings (influence.semantics): through the advantages (a frequency weight in its group's
reward mean and std, the loss normalization and its own term) or held (its own term only, advantages and
normalization as logged); w_T are the weights after replaying every optimizer step up to T (AdamW with its moments
and bias correction, gradient clipping, the schedule), and f is the forced target's mean log-prob on the probe
prompts.

- inputs.py: T, a finished run's paths, and the replayed training at step 0 with f, which every job starts from;
- resources.py: the saved states of the sweep on disk and one segment in memory, checked before it starts;
- objective.py: f itself and its gradient;
- trajectory.py: the replayed training with a data weight per rollout, through the group's advantages and the
  normalization or with both held (the forward pass), and its states;
- adjoint.py: one step backwards: AdamW's and clipping's adjoint, a Hessian-vector product of the step's
  loss and every rollout's weight in its four parts (own term, own advantage, siblings' advantages,
  normalization), from one double backward;
- metagradient.py: the reverse sweep over segments of recomputed steps (bounded memory);
- retrain.py: retraining with rollout weights changed, for the finite differences that check I (float64 end to
  end: model/precision.py) and for the LDS, each set from the sweep's state before its first removed rollout;
- preflight.py: before training, whether the model takes the influence's double backward and float64 checks;
- sets.py: the rollout sets retrained with them removed (LDS subsets, the leave-out replay's sets), as one job
  retrains them;
- table.py, markdown.py, figure.py: how well each estimator and control tracks I (the influence table, as
  Markdown, and the figure);
The rules' jobs, with the influence job's checks of itself (the replay against the saved checkpoints, the logged
gradient norms and forced target, I against finite differences of retraining), are in jobs/influence.py.
"""
