"""What the planner knows of a model and this machine: its profiles, measured or cached.

Part of the placement controller (engine/control/controller.py), which asks it for planner
inputs: planning a model from its cached profile before anything is built, the first start's
measurements run in the background between requests (dense timings, then the calibration), and
re-measuring on request. Runs on the engine thread.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable

import torch

from ..placement import DEFAULT_LOWEST_BITS, Placement, Tier
from ..planning.planner import PlanInputs
from ..measures.profile import Cancelled, uniform_profile
from ..protocol import ErrorEvent, Load, Progress


class Profiling:
    def __init__(self, emit: Callable[[object], None], tiers=None, tier_costs=None, seam: bool = False):
        """Test seams: tiers restricts the planner to these tiers; tier_costs replaces measured
        ones ({tier: (fixed_s, s_per_byte)}); seam plans gpu-* tiers on the CPU device."""
        self.emit = emit
        self.tiers, self.tier_costs, self.seam = tiers, tier_costs, seam
        self.cancel = threading.Event()  # stops a calibration (Stop with no request id)
        self.timings: tuple[float, float] | None = None  # the dense decode and prefill timings
        self.background = None  # the first start's measurements (a generator), while they run
        self.lowest_bits = DEFAULT_LOWEST_BITS  # the user's lowest precision for experts (4, 3 or 2)

    def low_tiers_run(self) -> bool:
        """Whether this machine measured the CPU tiers below 4 bits (the native library runs them)."""
        from .. import native

        return native.available()

    @property
    def calibrating(self) -> bool:
        return self.background is not None

    def measured_tiers(self, accel, ckpt=None) -> tuple:
        """The tiers below 16 bits this machine's calibration measures for ckpt (the seams: GPU tiers
        planned on the CPU; the planner kept to some tiers, which leaves at least cpu-4)."""
        from ..measures.profile import calibrated_tiers

        tiers = calibrated_tiers(accel.cpu_only and not self.seam, ckpt if self.low_tiers_run() else None)
        if self.tiers is not None:
            tiers = tuple(t for t in tiers if t in self.tiers) or tiers[:1]
        return tiers

    def progress(self, stage: str):
        return lambda d, t, w="": self.emit(Progress(stage=stage, done=d, total=t, what=w))

    def inputs(self, mp, accel, dims, dense_bytes: int, timings: tuple[float, float], streams: int,
               mapped: tuple[dict, int] = ({}, 0), ckpt=None, dtype=None) -> PlanInputs:
        """mapped: of the bytes, those served from the mapped file (engine/experts/tier_bytes.py mapped_bytes);
        ckpt, dtype: a GGUF file's blocks cost what its kernels do (planning/inputs.py with_file_costs)."""
        from ..measures.hardware import load_or_measure, tier_costs
        from ..measures.inputs import from_profiles, with_file_costs

        hw = load_or_measure(accel.device)
        inp = from_profiles(mp, hw, dims.top_k, dense_bytes, timings[0], dense_prefill_s=timings[1])
        if ckpt is not None:
            inp = with_file_costs(inp, ckpt, dtype)
        if accel.cpu_only and not inp.cpu_only:
            inp = replace(inp, cpu_only=True)
        if self.seam and accel.cpu_only:
            inp = replace(inp, cpu_only=False, tier_costs={
                **inp.tier_costs, **tier_costs([Tier.GPU16, Tier.GPU4], torch.device("cpu"))})
        if self.tier_costs is not None:
            inp = replace(inp, tier_costs={**inp.tier_costs, **self.tier_costs})
        if self.calibrating and not mp.calibration_tokens:  # a stand-in while the calibration runs
            inp = replace(inp, provisional=True)
        if self.tiers is not None:
            inp = replace(inp, tier_costs={t: c for t, c in inp.tier_costs.items() if Tier(t) in self.tiers})
        return replace(inp, streams=streams, mapped_bytes=mapped[0], dense_mapped=mapped[1], lowest_bits=self.lowest_bits)

    def plan_from_cache(self, ckpt, cmd: Load, budgets, slider: float, streams: int) -> Placement | None:
        """The placement planned from this model's cached profile and dense timings, before the
        model is built (None: no usable cache; load plans from the model's shape). budgets(accel,
        dense) -> the budgets to plan under."""
        from ..machine.devices import detect
        from ..native.dense_linear import compute_dtype
        from ..measures.inputs import dense_bytes_of
        from ..planning.planner import plan
        from ..measures.profile import cached_profile, dense_timings

        if self.tiers is not None or self.tier_costs is not None or self.seam:
            return None  # test seams change the inputs after the profile: plan after loading
        accel = detect(cmd.device)
        mp = cached_profile(ckpt, self.measured_tiers(accel, ckpt))
        if mp is None:
            return None
        dtype = compute_dtype(cmd.dtype, accel.device)
        timings = dense_timings(mp, accel.device, dtype)
        if timings is None:
            return None
        from ..experts.tier_bytes import mapped_bytes

        inp = self.inputs(mp, accel, ckpt.dims, dense_bytes_of(ckpt.dims, dtype), timings, streams,
                          mapped_bytes(ckpt, dtype, accel.cpu_only), ckpt, dtype)
        p = plan(inp, budgets(inp.cpu_only, accel), slider)
        return p.placement if p.fits else None

    def profile(self, loaded, remeasure: bool, have_inputs: bool):
        """The model profile to plan from, with `timings` set. A model with no cached profile gets
        uniform popularity and an assumed 4-bit sensitivity now, and its measurements start in the
        background (`step`); remeasure calibrates now. None: a re-measure was cancelled and the
        inputs held before stay (have_inputs)."""
        from ..measures.hardware import load_or_measure
        from ..measures.inputs import measure_dense_prefill_s, measure_dense_s
        from ..measures.profile import (cached_profile, calibrate_steps, calibration_ids, dense_timings,
                                        load_or_calibrate, save_dense_timings)

        self.background = None
        self.emit(Progress(stage="profile", done=0, total=1, what="measuring this machine"))
        hw = load_or_measure(loaded.accel.device, remeasure=remeasure)
        mp = None
        if remeasure:
            try:
                mp = load_or_calibrate(loaded.model, loaded.tokenizer, progress=self.progress("calibrate"),
                                       cancel=self.cancel, recalibrate=True, tiers=self.measured_tiers(loaded.accel, loaded.ckpt))
            except Cancelled:
                self.cancel.clear()
                if have_inputs:
                    self.emit(ErrorEvent(message="calibration cancelled: keeping the profile measured before"))
                    return None
        else:
            mp = cached_profile(loaded.ckpt, self.measured_tiers(loaded.accel, loaded.ckpt))
        background = mp is None
        if mp is None:
            mp = uniform_profile(loaded.model)
        timings = None if remeasure else dense_timings(mp, loaded.accel.device, loaded.model.dtype)
        if timings is None and background:  # estimated now, measured first thing in the background
            fixed, per_byte = hw.tier_costs["cpu-16" if loaded.accel.cpu_only else "gpu-16"]
            estimate = loaded.model.dense_bytes() * per_byte + loaded.ckpt.dims.layers * fixed
            timings = (estimate, estimate / 8)  # ASSUMED: a prefill token costs an eighth of a decode step
        elif timings is None:
            timings = (measure_dense_s(loaded.model, hw), measure_dense_prefill_s(loaded.model, hw))
            if mp.calibration_tokens:
                save_dense_timings(mp, loaded.ckpt.folder, loaded.accel.device, loaded.model.dtype, timings)
        self.timings = timings
        if background:
            self.cancel.clear()
            self.background = self._measure(loaded.model, hw, calibrate_steps(
                loaded.model, calibration_ids(loaded.tokenizer), self.measured_tiers(loaded.accel, loaded.ckpt),
                progress=self.progress("calibrate"), cancel=self.cancel))
        return mp

    def _measure(self, model, hw, calibration):
        """The first start's measurements, a step at a time: the dense decode and prefill timings,
        then the calibration. Returns the model profile."""
        from ..measures.inputs import measure_dense_prefill_s, measure_dense_s

        self.emit(Progress(stage="calibrate", done=0, total=1, what="timing the dense layers"))
        decode = measure_dense_s(model, hw)
        yield
        self.timings = (decode, measure_dense_prefill_s(model, hw))
        yield
        return (yield from calibration)

    def step(self, loaded, budget_s: float = 0.1):
        """Background measurements for about budget_s (between requests). Returns the measured
        profile when they end (saved with the model), else None. When they end, `calibrating` stays
        true until the caller sets `background` to None, once it has planned from the profile: a
        client waiting for the calibration to end sees the re-plan done."""
        from ..measures.profile import profile_path, save_dense_timings

        t0 = time.perf_counter()
        try:
            while time.perf_counter() - t0 < budget_s:
                next(self.background)
        except StopIteration as done:  # `background` stays set until the caller has planned from it
            mp = done.value
            try:
                mp.save(profile_path(loaded.ckpt.folder))
                save_dense_timings(mp, loaded.ckpt.folder, loaded.accel.device, loaded.model.dtype, self.timings)
            except OSError as e:
                self.emit(ErrorEvent(message=f"the model's profile could not be saved ({e}); it is measured "
                                     "again next time"))
            return mp
        except Cancelled:
            self.background = None
            self.cancel.clear()
            self.emit(ErrorEvent(message="calibration cancelled: planning with uniform popularity and an assumed "
                                 "4-bit sensitivity (Tools → Re-measure runs it)"))
        except BaseException:
            self.background = None  # a failed calibration is reported once, not retried step after step
            raise
        return None
