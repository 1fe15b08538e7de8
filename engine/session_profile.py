"""The engine thread's profiling half (a part of Session, kept in its own module): planning a
model from its cached profile before anything is built, the first start's measurements run in the
background between requests (dense timings, then the calibration), and re-measuring on request.
Methods of Session; they run on the engine thread."""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from .placement import Placement, Tier
from .planning.planner import PlanInputs, slider_scale
from .planning.profile import Cancelled, uniform_profile
from .protocol import ErrorEvent, Load, Progress


class Profiling:
    def _plan_from_cache(self, ckpt, cmd: Load) -> Placement | None:
        """The placement planned from this model's cached profile and dense timings, before the
        model is built (None: no usable cache; load plans from the model's shape)."""
        from .devices import detect
        from .kernels import auto_dtype
        from .load import DTYPES
        from .planning.inputs import default_budgets, dense_bytes_of
        from .planning.planner import plan
        from .planning.profile import cached_profile, dense_timings

        try:
            if self.tiers is not None or self.tier_costs is not None or self.seam:
                return None  # test seams change the inputs after the profile: plan after loading
            mp = cached_profile(ckpt)
            if mp is None:
                return None
            accel = detect(cmd.device)
            dtype = DTYPES[cmd.dtype] or auto_dtype(accel.device)
            timings = dense_timings(mp, accel.device, dtype)
            if timings is None:
                return None
            inp = self._inputs(mp, accel, ckpt.dims, dense_bytes_of(ckpt.dims, dtype), timings)
            budgets = self._first_budgets(cmd.device) or default_budgets(inp.cpu_only, accel.device)
            p = plan(inp, budgets, self.slider)
            return p.placement if p.fits else None
        finally:
            ckpt.close()

    def _inputs(self, mp, accel, dims, dense_bytes: int, timings: tuple[float, float]) -> PlanInputs:
        from .planning.hardware import load_or_measure, tier_costs
        from .planning.inputs import from_profiles

        hw = load_or_measure(accel.device)
        inp = from_profiles(mp, hw, dims.top_k, dense_bytes, timings[0], dense_prefill_s=timings[1])
        if accel.cpu_only and not inp.cpu_only:
            inp = replace(inp, cpu_only=True)
        if self.seam and accel.cpu_only:
            inp = replace(inp, cpu_only=False, tier_costs={
                **inp.tier_costs, **tier_costs([Tier.GPU16, Tier.GPU4], torch.device("cpu"))})
        if self.tier_costs is not None:
            inp = replace(inp, tier_costs={**inp.tier_costs, **self.tier_costs})
        if self.tiers is not None:
            inp = replace(inp, tier_costs={t: c for t, c in inp.tier_costs.items() if Tier(t) in self.tiers})
        return replace(inp, streams=self.plan_streams)

    def _profile(self, remeasure: bool) -> None:
        """Both profiles -> the planner's inputs and the slider's scale. A model with no cached
        profile is planned at once with uniform popularity and an assumed 4-bit sensitivity, and
        calibrated in the background, between requests (_calibrate_slice), so it can chat from the
        first second; remeasure calibrates now."""
        from .planning.hardware import load_or_measure
        from .planning.inputs import measure_dense_prefill_s, measure_dense_s
        from .planning.profile import (cached_profile, calibrate_steps, calibration_ids, dense_timings,
                                       load_or_calibrate, save_dense_timings)

        loaded = self.loaded
        self._calib = None
        self.emit(Progress(stage="profile", done=0, total=1, what="measuring this machine"))
        hw = load_or_measure(loaded.accel.device, remeasure=remeasure)
        mp = None
        if remeasure:
            try:
                mp = load_or_calibrate(loaded.model, loaded.tokenizer, progress=self._progress("calibrate"),
                                       cancel=self.calib_cancel, recalibrate=True)
            except Cancelled:
                self.calib_cancel.clear()
                if self.inputs is not None:
                    self.emit(ErrorEvent(message="calibration cancelled: keeping the profile measured before"))
                    return
        else:
            mp = cached_profile(loaded.ckpt)
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
        self._timings = timings
        self._use_profile(mp)
        if background:
            self.calib_cancel.clear()
            self._calib = self._background_profile(hw, calibrate_steps(
                loaded.model, calibration_ids(loaded.tokenizer), progress=self._progress("calibrate"),
                cancel=self.calib_cancel))

    def _background_profile(self, hw, calibration):
        """The first start's measurements, a step at a time between requests: the dense decode
        and prefill timings, then the calibration. Returns the model profile."""
        from .planning.inputs import measure_dense_prefill_s, measure_dense_s

        model = self.loaded.model
        self.emit(Progress(stage="calibrate", done=0, total=1, what="timing the dense layers"))
        decode = measure_dense_s(model, hw)
        yield
        self._timings = (decode, measure_dense_prefill_s(model, hw))
        yield
        return (yield from calibration)

    def _use_profile(self, mp) -> None:
        loaded = self.loaded
        self.inputs = self._inputs(mp, loaded.accel, loaded.ckpt.dims, loaded.model.dense_bytes(), self._timings)
        self.scale = slider_scale(self.inputs)
        self._frontier = None
        self.migrator.dense_on_accelerator = not self.inputs.cpu_only

    def _progress(self, stage: str):
        return lambda d, t, w="": self.emit(Progress(stage=stage, done=d, total=t, what=w))

    def _calibrate_slice(self, budget_s: float = 0.1) -> None:
        """Run calibration steps for about budget_s (between requests); when it ends, plan from
        the measured profile, moving only what changes."""
        from .planning.profile import profile_path, save_dense_timings

        t0 = time.perf_counter()
        try:
            while time.perf_counter() - t0 < budget_s:
                next(self._calib)
        except StopIteration as done:
            mp, ld = done.value, self.loaded
            try:
                try:
                    mp.save(profile_path(ld.ckpt.folder))
                    save_dense_timings(mp, ld.ckpt.folder, ld.accel.device, ld.model.dtype, self._timings)
                except OSError as e:
                    self.emit(ErrorEvent(message=f"the model's profile could not be saved ({e}); it is measured "
                                         "again next time"))
                self._use_profile(mp)
                self._emit_loaded()
                self._replan("profile")
            finally:
                self._calib = None  # only now: a client waiting for it sees the re-plan done
        except Cancelled:
            self._calib = None
            self.calib_cancel.clear()
            self.emit(ErrorEvent(message="calibration cancelled: planning with uniform popularity and an assumed "
                                 "4-bit sensitivity (Tools → Re-measure runs it)"))
        except BaseException:
            self._calib = None  # a failed calibration is reported once, not retried step after step
            raise

