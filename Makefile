# Shortcuts for the scripts in scripts/ (the README's commands).
.PHONY: serve test bench
serve:
	scripts/serve
test:
	scripts/test
bench:
	scripts/bench
