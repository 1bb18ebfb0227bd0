"""A person's data: who a fact belongs to (:mod:`~clawmem.privacy.subjects`), a subject's export
and erasure (:mod:`~clawmem.privacy.erasure`), and the live check that one site's stores do not
see another's (:mod:`~clawmem.privacy.isolation`). A subject's own namespace is a naming rule and
lives on the ground floor (:func:`clawmem.rules.subject_namespace`).

It stands on the site (:mod:`clawmem.sites`) and the floors below it; only the queue and the
entrances import it.
"""
