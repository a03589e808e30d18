"""Control loops (migrator, resizer, elastic optimizer) and what they share.

Usage for a new loop (see extender/control/migrator.py for a complete one):

    # extender/control/resizer.py
    from extender.control.loop import Action
    from extender.kube.errors import TemporaryError, PermanentError
    from extender.control.runtime import ControlContext

    class Resizer:
        name = "resizer"
        def __init__(self, ctx: ControlContext) -> None: ...
        def plan(self, now: float) -> list[Action]:      # pure decision from ctx.state/ctx.tracker
            ...                                         # (call a scoring/ function on arrays)
        def act(self, action: Action, now: float) -> str:  # one write; returns an outcome label
            ...  # ctx.actions (KubeActions: evict, annotate_pod, namespace_labels) raise
                 # TemporaryError (429/5xx/409: retried after delay) or PermanentError
            ctx.recorder.record(ObjectRef(ns, pod, uid), "FlowschedResized", "cpu 2 -> 4: G=0.31 ...")
            return "resized"
        def describe(self) -> dict: ...  # optional: extra JSON for /debug/resizes

    def build(ctx: ControlContext) -> Resizer:
        return Resizer(ctx)

Then: the name in Settings.controllers' Literal and in runtime.FACTORIES, optionally a
`resizer: ResizerConfig(LoopConfig)` settings field (interval_s, max_per_interval, max_per_hour).

What the runtime does for every loop (extender/control/runtime.py, wired in Service.start/stop):
- leader.py: one Lease (control.lease_namespace/lease_name) for all loops of a replica;
  a loop plans and acts only while `is_leader` (checked before planning and before each act).
- loop.py ControlLoop: every interval_s: plan -> for each action: back-off? budget? dry run?
  -> act; TemporaryError(delay_s) parks the action's key, PermanentError parks it for
  control.permanent_backoff_s; metrics flowsched_control_actions_total{loop,action,outcome},
  flowsched_control_ticks_total{loop,result}, flowsched_control_leader{loop}.
- budget.py ActionBudget: per interval and per sliding hour (pure, injected clock).
- events.py EventRecorder: core/v1 Events, reason must start with "Flowsched", reporting
  component flowsched, reporting instance = the replica's identity; never raises.
- kube_actions.py KubeActions: policy/v1 Eviction (429 -> TemporaryError, 404 -> "gone"),
  annotation merge-patches, namespace labels (for the opt-out label).
- Settings: `controllers` (env FLOWSCHED_CONTROLLERS='["migrator"]', CLI --controllers
  migrator,resizer), `control` (ControlConfig: dry_run defaults to TRUE, lease, opt-outs).
- Routes: /debug/control, /debug/migrations, /debug/resizes, /debug/elastic.
"""
