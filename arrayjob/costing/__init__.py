"""What a job costs: prices, the measured machine profile, and the estimate built on the plan."""
