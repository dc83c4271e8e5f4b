"""What is measured outside a search's loop, each in a worker: the prepare step every search and measurement begins
with (prepare.py: the model resolved or built, the reference measured), one configuration with no study
(configuration.py: `autotune measure`), and the hand-written decode loop's ceiling (ceiling.py: `autotune ceiling`).
Re-exports nothing, so that importing it loads no study library."""
