"""The exit statuses every command shares, one per kind of ending (docs/exit-status.md).

A script can tell a check's "no" from a command that could not run, as with diff(1) and cmp(1):

    0    done; a check found nothing beyond its tolerance
    1    a check found a difference beyond its tolerance (parity, port-check, compare)
    2    the command could not do what was asked: a flag argparse refuses (with the usage), a
         value, a file or a run it cannot use or finish (one line, no usage)
    130  interrupted by Ctrl-C (SIGINT), 143 by SIGTERM: 128 + the signal's number
"""

OK = 0
DIFFERENT = 1
TROUBLE = 2
