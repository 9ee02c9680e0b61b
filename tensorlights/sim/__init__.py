"""A flow-level discrete-event simulator of PS and all-reduce jobs on shared egress links,
driving the real policy code (policy/bands.py, policy/packing.py, policy/schedule.py, the
controller's Registry and Planner) with a simulated clock.

    network.py   egress links shared by flows: FIFO (processor sharing), per-job fair, or
                 strict priority bands with work conservation (our HTB tree)
    engine.py    jobs as iterations (a PS's pushes, compute, barrier; a ring's compute and
                 all-reduce steps), per-host telemetry as the agent measures it, the event loop
    drivers.py   who sets the bands: nobody (FIFO), our agents per host, the prototype per
                 host, our agents following the controller
    calibrate.py the benchmark's scenarios simulated against its measured medians

What is not modelled, on purpose or not yet: TCP's dynamics (slow start, loss, ACK clocking;
a link's flows share it exactly), worker-side links (unshaped in the testbed; a synthetic
job's gradient is 4 KB), and the agents' measurement errors (telemetry sees every push
exactly, and a ring's iterations whole).
"""
