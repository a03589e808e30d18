"""The control loops' service shell: each loop's plan is the kernel's (scoring.kernel); this wing
builds the World the kernel plans from and carries its typed actions out.

A controller (see extender/control/migrator.py for a complete one) is what the service knows of
one loop, found by name in runtime.FACTORIES:

    class Migrator:
        name = "migrator"
        def world(self, now: float) -> World | None: ...   # its part of the World (reads only)
        def bind(self, action: ControlAction) -> Action: ...  # the pods the action is carried out on
        def planned(self, plan: Plan) -> None: ...  # gauges and the /debug view, from the kernel's plan
        def act(self, action: Action, now: float) -> str: ...  # one write; an outcome label, or raises
            # TemporaryError (429/5xx/409: retried after delay) or PermanentError (kube.errors)
        def describe(self) -> dict: ...  # optional: extra JSON for /debug/<loop>

What the runtime does for every loop (runtime.py, wired in Service.start/stop):
- leader.py: one Lease (control.lease_namespace/lease_name) for all loops of a replica; a
  round plans only while `is_leader`, and each action checks it again.
- loop.py ControlRounds: the one rounds runner (a PeriodicRunner, thread control-rounds): each
  round, the due loops through scoring.kernel.run_round (LOOP_ORDER, composition, the shared
  budgets, one meaning of dry run), a World built per loop after the earlier ones acted; the
  budgets loaded from and saved to the budget Lease (budget_store.py), the saved eviction marks
  read into the state the first round it leads (mark_store.py; evict_job saves them); the kernel's
  Memory kept between rounds. lease_notes.py: both Leases' read-modify-write. ControlLoop: one
  loop's back-offs, metrics and recent ticks.
- events.py EventRecorder: core/v1 Events, reason must start with "Flowsched".
- kube_actions.py KubeActions: policy/v1 Eviction, annotation merge-patches, namespace labels.
- bottleneck.py: the diagnoser (its own PeriodicRunner) whose diagnoses the World carries.
- Routes: /debug/control, /debug/{migrations,resizes,admission,elastic,idle,remedies}.
"""
