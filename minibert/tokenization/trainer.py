def train_wordpiece(*a,**k): raise NotImplementedError
class TrainedVocab(list): pass
class TrainingReport: pass
