"""The live panel and the slider: memory meters, the tok/s chart and migration progress (live_panel.py),
the placement map (placement_map.py), the frontier chart (frontier_chart.py), the quality <-> speed slider
(quality_slider.py), the readouts in plain words (plain_words.py), and the panel shown or hidden
(switch.py).
"""
